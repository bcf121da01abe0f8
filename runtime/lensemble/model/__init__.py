"""The federated world model: architecture, JEPA objective and the participant's learner."""
