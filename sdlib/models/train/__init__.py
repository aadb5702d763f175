"""Training the embedded tiny models (``sdlib train``)."""
