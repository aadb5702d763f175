"""The bottom layer: definitions every stage shares; imports nothing from sdlib."""
