"""Images through the serving path: inputs, chat, spans, encoder budget and cache, runtime."""
