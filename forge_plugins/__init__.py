"""Forge's built-in components, written exactly as a third-party plugin package would be."""
