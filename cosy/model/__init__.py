"""A model directory: its files, its yaml read as data, its family, and loading its weights strictly."""
