"""Offline batch synthesis: a JSON Lines manifest in, audio files and a results file out (`python -m cosy batch`).

manifest (lines -> items) -> runner (the frontend's worker pool, many lines in flight) -> results (files
written whole, a results record per line, resumable); progress shows it.
"""
