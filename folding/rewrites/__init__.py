"""Rewrites of the working program before analysis, each a formula, its dtype rule and its preconditions."""
