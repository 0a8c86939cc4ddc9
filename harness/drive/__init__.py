"""The workload driver: the streaming client, what a run sends, and driving on a box."""
