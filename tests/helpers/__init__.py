"""Shared test helpers: small seeded data and nets, and a 2-process gloo harness."""
