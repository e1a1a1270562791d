"""Model lifecycle (§3, §10–§13): generations loaded, unloaded, drained and rolled back."""
