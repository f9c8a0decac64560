"""The cosy frontend: CosyVoice2 WebUI, gradio_client API and HTTP APIs.

    python app.py --model_dir iic/CosyVoice2-0.5B --data_dir data --port 50000 [--workers 2]

Flags: `python app.py --help`; everything lives in `cosy.frontend.server`.
"""
import sys

from cosy.frontend import main  # light: the server itself is imported when main() runs

if __name__ == "__main__":
    main(sys.argv[1:])
