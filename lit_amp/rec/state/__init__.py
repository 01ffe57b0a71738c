"""Training state on disk while training goes on: row tracking (``touched``)."""
