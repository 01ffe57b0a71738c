"""Pure PyTorch mixed precision: levels, lists, loss scaling, train-step cells (no Lightning)."""
