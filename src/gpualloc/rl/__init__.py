"""Learning: Gymnasium environments for placement and scheduling, and the DQN agent they share."""
