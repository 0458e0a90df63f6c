"""Closed-loop evaluation of policies: statistics, reports, plots and the HTML trajectory viewer."""
