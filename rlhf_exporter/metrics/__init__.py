"""The metric catalog (one definition of every series) and the scrape-time collector."""
