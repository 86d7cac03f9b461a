"""Presentation: figure builders, HTML report, Dash app, exporters."""
