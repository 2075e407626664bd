"""Images through the serving path: content parts and processing (`inputs`, `chat`), the
per-request placeholder spans the scheduler and prefix cache see (`spans`, torch-free), the
encoder budget and cache (`encoder_cache`), and the step inputs of the model runner
(`runtime`)."""
