-- The database the control replicas of docker-compose.yml share (--storage, from
-- TAILRACE_CONTROL_STORAGE in deploy/secrets/control.env); they create their tables in it.
CREATE DATABASE tailrace_control;
