"""The embedded manager behind `corral up`: job specs, the store, auth, the control loop and the API."""
