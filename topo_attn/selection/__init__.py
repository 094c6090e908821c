"""Selection quality: how much of full causal attention a block schedule keeps, and the selectors to compare."""
