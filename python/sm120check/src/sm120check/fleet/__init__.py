"""The fleet view: doctor reports of many nodes, aggregated into one matrix, and compared between runs."""
