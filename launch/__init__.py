"""Start-up helpers for the frontend and backend scripts: model resolution, the shared data dir."""
