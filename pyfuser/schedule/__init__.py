"""Schedulers: each says whether it can take a fusion segment, picks parameters, applies them."""
