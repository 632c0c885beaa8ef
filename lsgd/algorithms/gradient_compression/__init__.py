"""Gradient compression: static compressors, Accordion, GraVAC (on the all-reduce path), and DeMo (a local
momentum's DCT components, all-gathered in place of the gradient all-reduce)."""
