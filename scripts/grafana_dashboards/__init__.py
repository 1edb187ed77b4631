"""The builder of protolab's Grafana dashboards; scripts/gen_dashboards.py writes what it builds.

queries: the datasources and the text of the panels' queries; panels: the panel kinds and their
layout; dashboard: the frame around the panels (variables, annotations, links); k6_client, server
and matrix: the five dashboards; importable: the variant for Grafana's Import page.
"""
