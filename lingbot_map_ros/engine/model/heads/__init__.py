"""heads package."""
