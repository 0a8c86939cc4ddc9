"""The workload driver: the streaming client, what a run sends, driving on a box, and routing
read from whole responses."""
