"""Deployment: model download and resolution, the shared data dir, saved voices, the backend launcher."""
