"""The frontend's synthesis service: worker processes and the request queue."""
