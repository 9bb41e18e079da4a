"""The rank's side: one training process per device (`python -m trainstack.train.rank`), started by the agent."""
