"""Lightning precision plugins built on lit_amp.amp."""
