"""Verification tools: golden cases, golden_check, and the random-weight model builder."""
