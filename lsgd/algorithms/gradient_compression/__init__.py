"""Gradient compression on the all-reduce path: static compressors, Accordion, GraVAC."""
