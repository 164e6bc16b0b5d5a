"""Test helpers: tiny random-weight target/drafter pairs made from configs (no downloads)."""
