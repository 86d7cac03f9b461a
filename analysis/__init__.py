"""Analysis: metrics, model spec and cost model, roofline, energy, advisor, summary."""
