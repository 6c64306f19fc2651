"""ros package."""
