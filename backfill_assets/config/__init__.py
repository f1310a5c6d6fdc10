"""Configuration: every environment variable declared once, read once into ``Settings``."""
