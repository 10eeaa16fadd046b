"""The stages of the fold and the rules they read (docs/design.md, "Package layout")."""
