"""Sub-commands of the core package."""
