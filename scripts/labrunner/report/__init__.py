"""The run report: statistics over repeats, comparisons, charts and the document."""
