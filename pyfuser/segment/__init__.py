"""Segmenter: splits a Fusion into kernel segments and host (metadata-only) segments."""
