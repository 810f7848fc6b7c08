"""The Laya decision model, its tokenizer, checkpoint layout and saved inputs."""
