"""Every ``sdlib`` subcommand (the sweep commands, ``train``)."""
