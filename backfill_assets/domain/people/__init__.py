"""People in the loop, pure: a previous classifier's results read onto the policy's labels."""
