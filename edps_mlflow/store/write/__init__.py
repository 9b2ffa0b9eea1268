"""What commands write to the store; every write of a run goes through one of these modules."""
