"""BlurBall and its data: the model, the synthetic clips, the decoder of the ball, scoring, training and its cost."""
