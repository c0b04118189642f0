"""Private helpers every stage may use: atomic output, JSON records, thread limits, wrapped forwards."""
