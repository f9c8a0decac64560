"""Serve the speech-token LM of a model directory on vLLM's OpenAI server (the logic: cosy/deploy/backend.py).

    python launch/backend.py --model_dir DIR --api_key KEY [--host 0.0.0.0] [--port 8000] [-- vLLM flags]
"""
import sys

from cosy.deploy.backend import main

if __name__ == "__main__":
    sys.exit(main())
