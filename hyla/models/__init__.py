"""Model assembly: hybrid decoder (`hybrid`), family adapters (`registry`), checkpoint loader."""
