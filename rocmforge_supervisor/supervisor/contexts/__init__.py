"""Kept context: a model's saved KV-cache slots (keep_context) and the conversation tier (keep_conversations)."""
