"""The report: what happened on this host, judged, on one page.
"""
