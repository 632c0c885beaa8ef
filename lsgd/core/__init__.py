"""Leaf utilities every layer may use: errors, atomic files, seeds, config-value checks, device
resolution. Nothing here imports another lsgd package."""
