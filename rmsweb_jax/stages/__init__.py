"""Recipe stages run by `rmsweb_jax.main`: each is `run(config, workdir)`."""
