"""Frontends of one cosy instance: the service every surface calls (`service`), the Gradio WebUI (`webui`),
the gradio_client API (`gradio_api`) and the process that serves them (`server`, run by app.py)."""
