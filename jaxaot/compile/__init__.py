"""Stage 3, compile: turn each program into an executable, through the persistent cache."""
