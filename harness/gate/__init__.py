"""The gates: the card's promotion rules over a campaign's analysis, giving a verdict."""
