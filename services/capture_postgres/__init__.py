"""capture-postgres: logical replication with pgoutput through psycopg 3, published to the bus."""
