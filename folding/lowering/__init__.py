"""What serves executorch 1.5.1's lowering of a program, not the fold: no fold module imports it."""
